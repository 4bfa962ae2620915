"""The rank-4 model on the paper's corpus: 45,000 ROCStories (../shared/data), split 80/10/10 by
story hash (36,040 / 4,522 / 4,438 stories, one window each at T = 4), sized for a 2-core CPU.

    python train.py --config=configs/rocstories.py --workdir=runs/rocstories
    python eval.py --workdir=runs/rocstories --split=test
    python compare.py --rank4_config=configs/rocstories.py \\
        --baseline_config=configs/baseline_rocstories.py --workdir=runs/compare_roc

Short variant for a quick check: ``--config.num_steps=1200`` (about 8 minutes).

Word vocabulary, lowercase, words seen at least 3 times in the training split (V = 14,171; 1.3% of
validation tokens become UNK; N = 16 cuts 0.7% of the sentences). N = 16, T = 4 as in the paper;
dx = 16, dt = 8, H = 2, L = 2 (915,328 parameters: the tied factorised readout costs D·V per
position, so the fiber is kept small). AdamW as in the paper (wd 0.01) at 1e-3 with a 200-step warmup.
"""

from configs import default


def get_config():
    c = default.get_config()
    c.data.source = "file"
    c.data.path = "../shared/data/rocstories_spring2016_first45000.csv"
    c.tokenizer.kind = "word"
    c.tokenizer.lowercase = True
    c.tokenizer.min_count = 3
    c.model.n_tokens = 16
    c.model.n_slices = 4
    c.model.dx = 16
    c.model.dt = 8
    c.model.n_heads = 2
    c.model.n_layers = 2
    c.model.dropout = 0.1
    c.optim.learning_rate = 1e-3
    c.optim.warmup_steps = 200
    c.optim.weight_decay = 0.01
    c.batch_size = 32
    c.eval_batch_size = 64
    c.num_steps = 7000
    c.log_every = 100
    c.eval_every = 500
    c.checkpoint_every = 500
    c.keep_checkpoints = 2
    c.compact_buckets = 8  # only positions whose input or target is not PAD (docs/performance.md)
    return c
