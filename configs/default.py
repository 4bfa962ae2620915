"""Default run: a tiny rank-4 model on the built-in procedural story corpus (nothing downloaded).

    python train.py --config=configs/default.py --workdir=runs/default
    python eval.py --workdir=runs/default --split=test

Expected runtime: about 1 minute on 2 CPU cores (2,500 steps of 32 windows, 31.7k parameters,
compile included); the validation LS(T) falls from about 5 nats (uniform over the ~150-word
vocabulary) to about 0.75. The remaining loss is the corpus's own randomness: each ending has two
or three phrasings.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.model_family = "rank4"
    c.seed = 0
    c.data, c.tokenizer, c.model, c.optim, c.mesh = data(), tokenizer(), model(), optim(), mesh()
    loop(c)
    return c


def data() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.source = "builtin"  # "builtin" (procedural corpus) or "file" (data.path)
    c.path = ""  # one file, or several separated by commas
    c.format = "auto"  # auto | rocstories | storycloze | text
    c.builtin_stories = 8000
    c.builtin_seed = 0
    c.split = (0.8, 0.1, 0.1)  # train / validation / test by a stable hash of the story id
    c.split_salt = ""
    return c


def tokenizer() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.kind = "word"  # word | sentencepiece
    c.build_on = "train"  # train (split) | all (the paper's choice: the whole pool)
    c.min_count = 1  # word
    c.lowercase = False  # word
    c.vocab_size = 8000  # sentencepiece (upper bound)
    c.model_type = "unigram"  # sentencepiece: unigram | bpe | word | char
    return c


def model() -> ml_collections.ConfigDict:
    """The rank-4 family's section (other families: their configs)."""
    c = ml_collections.ConfigDict()
    c.n_tokens = 12  # N
    c.n_slices = 4  # T
    c.dx = 8
    c.dt = 4
    c.n_heads = 2
    c.n_layers = 2
    c.dropout = 0.1
    c.attention = "autodiff"
    # The slices the training loss averages over: "all", S(1..T) (the paper's), or "last", S(T) only (an
    # extra: with no temporal mask the targets S(1..T-1) are visible input sentences). Part of the identity.
    c.objective_slices = "all"
    # How a token enters and leaves the fiber: "outer", Esem ⊗ Etmp (the paper's), or "flat", a free
    # vector of D numbers per token with a readout tied to it (an ablation of the factorisation).
    c.token_code = "outer"
    # Which keys a query's one softmax runs over: "joint", the whole N × T grid (the paper's), or "axial",
    # within its slice, then across the slices at its token position, with the same maps (an ablation).
    c.attention_grid = "joint"
    c.zpx = ml_collections.ConfigDict()  # ZPX geometric attention scores (seed 001)
    c.zpx.score = "standard"  # standard | zpx_angle | zpx_angle_sphere
    c.zpx.channels = 8  # C phase channels
    c.zpx.lambda_angle = 1.0  # λθ
    c.zpx.lambda_sphere = 1.0  # λS
    c.zpx.center_weight = 0.0  # centre-cancellation regulariser weight (ZPX scores only)
    return c


def optim() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.learning_rate = 3e-3
    c.weight_decay = 0.01
    c.b1 = 0.9
    c.b2 = 0.999
    c.eps = 1e-8
    c.warmup_steps = 50
    # After the warmup: "constant" (the paper's), or a "cosine" / "linear" decay to end_lr_factor × the
    # rate at num_steps (optax's schedules); changeable on resume like every optim setting.
    c.schedule = "constant"
    c.end_lr_factor = 0.0
    c.grad_clip_norm = 0.0  # 0 = off
    return c


def mesh() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.data = -1  # devices along the batch axis (-1: all devices not used by mesh.model)
    c.model = 1  # devices along the head / MLP-width axis
    return c


def loop(c: ml_collections.ConfigDict) -> None:
    """The top-level keys of batching, the step loop, evaluation and checkpoints."""
    c.batch_size = 32
    # Each train step's batch as this many microbatches of batch_size / grad_accum_steps windows,
    # their gradients added in a lax.scan: the same update, one microbatch's activations alive.
    c.grad_accum_steps = 1
    # The dtype matmuls and activations compute in: float32 or bfloat16 (parameters, optimiser state,
    # softmax and LayerNorm statistics, losses and checkpoints stay float32; rank4jax.models.precision).
    c.compute_dtype = "float32"
    # A jax.profiler trace of these train steps ("first:last", e.g. "20:25"; "" = off) under
    # <workdir>/profile/, for TensorBoard's profile plugin or Perfetto.
    c.profile_steps = ""
    # Cut each training batch's trailing all-PAD token columns to a multiple of this (0 = never):
    # exact for the rank-4 loss, fewer positions to compute, at most ⌈N / multiple⌉ compiled shapes.
    c.trim_padding_multiple = 4
    # Train the rank-4 model on compact batches (rank4jax.data.compact): only the positions whose
    # input or target token is not PAD, rounded up to 1/compact_buckets of the batch (a few compiled
    # shapes); exact for the loss. 0 = off (then trim_padding_multiple applies). Off for this tiny
    # model (D = 32), whose step is overhead-bound: 16.1 vs 13.1 ms/step measured; the Story Cloze
    # and paper configs (D ≥ 128) turn it on.
    c.compact_buckets = 0
    # Which of those layouts the steps consume: "auto" times the enabled ones (compact, trimmed, full
    # width) on the first batches and keeps the fastest (a few seconds at start-up, logged, kept on
    # resume); "rule" takes the first enabled one unmeasured; or name one.
    c.batch_layout = "auto"
    c.eval_batch_size = 64
    c.num_steps = 2500
    c.log_every = 50
    c.eval_every = 250
    c.checkpoint_every = 500
    c.keep_checkpoints = 2
    # Stop after this many validations without improvement of the selection loss (0 = off); every
    # validated step is then checkpointed, so a resumed run stops at the same step.
    c.early_stop_patience = 0
    # The validation loss that selects the best checkpoint and drives early stopping: "window" (the
    # paper's: the family's window loss, for the rank-4 model the mean CE over every target of
    # S(1..T), three quarters of them copies of visible input sentences) or "last_slice" (LS(T), the
    # mean CE over the content tokens of S(T); an extra). Part of the run's identity.
    c.selection = "window"
    c.progress_bar = True
    c.plots = True  # draw plots/curves.png at the end of each run (matplotlib; ``python -m rank4jax.training.metrics``)
