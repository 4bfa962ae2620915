"""The 1-D causal baseline at the paper's sizes (SPEC §7: D = dx·dt = 2048, H=4, L=2, 175.9M
parameters at V=36,711), trained free-running on the ROCStories pool. For GPU/TPU.

    python train.py --config=configs/baseline_paper.py --workdir=runs/baseline_paper \\
        --config.data.path=ROCStories_winter2017.csv,ROCStories__spring2016.csv

Expected runtime: the paper reports 45.2 h on two RTX 3080s; impractical on a 2-core CPU.
"""

from configs import rocstories_paper
from rank4jax.engine.run_config import model_section


def get_config():
    c = rocstories_paper.get_config()
    c.model_family = "baseline"
    c.model = model_section("baseline", c.model)  # its own fields: no attention mode
    c.model.teacher_forcing = False
    return c
