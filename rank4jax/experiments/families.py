"""The ladder's model families: what each is, which trains at another's rate, which are the grid
ablations and which LS(T) is teacher-forced."""

FAMILIES = {  # name → (model family, what it is)
    "rank4": ("rank4", "rank-4, the paper's objective and selection"),
    "rank4_last": ("rank4", "rank-4, objective S(T) only, selected on LS(T) (extra)"),
    "baseline": ("baseline", "1-D baseline, free-running, parameter-matched"),
    "baseline_lm": ("baseline_lm", "teacher-forced causal LM on every token, parameter-matched (reference)"),
    "flat": ("rank4", "the rank-4 grid with a free D-vector per token, the rung's fiber (ablation)"),
    "flat_matched": ("rank4", "the flat grid at the fiber matching the rank-4 parameter count (ablation)"),
    "axial": ("rank4", "rank-4 with axial attention: within each slice, then across the slices (ablation)"),
}
# families trained at another family's rate when both are in the plan (the same model at another size:
# its sweep would repeat the other's); without that family in the plan, a family sweeps its own
RATE_OF = {"flat_matched": "flat"}
GRID_ABLATIONS = ("flat", "flat_matched", "axial")  # tested against the rank-4 model and the baseline alike
TEACHER_FORCED = frozenset({"baseline_lm"})  # LS(T) after the gold S(T) tokens: no Δ against the free-running ones
