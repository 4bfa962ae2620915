"""The rank-4 model on the paper's corpus: 45,000 ROCStories (../shared/data), split 80/10/10 by
story hash (36,040 / 4,522 / 4,438 stories, one window each at T = 4), sized for a 2-core CPU.

    python train.py --config=configs/rocstories.py --workdir=runs/rocstories
    python eval.py --workdir=runs/rocstories --split=test
    python compare.py --rank4_config=configs/rocstories.py \\
        --baseline_config=configs/baseline_rocstories.py \\
        --cloze_data=../shared/data/storycloze_val_2016.csv --workdir=runs/compare_roc

Expected runtime: 57 minutes on 2 CPU cores (measured: 3,410 s for 7,000 steps of 32 windows,
about 75 windows/s, 14 validation passes included). The validation window loss and LS(T) are
lowest at the last step (LS(T) 5.746, still falling by about 0.01 per 1,000 steps at the end).
Short variant for a quick check: ``--config.num_steps=1000`` (6 minutes measured; validation
LS(T) 6.064).

Word vocabulary, lowercase, words seen at least 3 times in the training split (V = 14,171; 1.3% of
validation tokens become UNK; N = 16 cuts 0.7% of the sentences). N = 16, T = 4 as in the paper;
dx = 16, dt = 8, H = 2, L = 2: 914,784 parameters (the tied factorised readout costs D·V per
position, so the fiber is kept small). AdamW as in the paper (wd 0.01, dropout 0.1) at 1e-3 with a
200-step warmup. Results beside the baseline's: docs/rocstories.md.
"""

from configs import storycloze


def get_config():
    c = storycloze.get_config()  # the same model: N = 16, T = 4, dx = 16, dt = 8, H = 2, L = 2, compact batches
    c.data.path = "../shared/data/rocstories_spring2016_first45000.csv"
    c.tokenizer.min_count = 3  # lowercase word vocabulary over the training split
    c.model.dropout = 0.1  # 29x the stories of Story Cloze: the paper's regularisation
    c.optim.weight_decay = 0.01
    c.optim.warmup_steps = 200
    c.num_steps = 7000
    c.log_every = 100
    c.eval_every = 500
    c.checkpoint_every = 500
    return c
