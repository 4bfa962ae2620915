"""The real Story Cloze stories (1,571 five-sentence stories), split 80/10/10 by story hash.

    python train.py --config=configs/storycloze.py --workdir=runs/storycloze
    python eval.py --workdir=runs/storycloze --split=test        # also reports Story Cloze accuracy

Any other Story Cloze / ROCStories CSV or text file: ``--config.data.path=PATH``.
Expected runtime: about 2.5 minutes on 2 CPU cores (800 steps of 32 windows at N=16, T=4, dx=16,
dt=8, H=2, L=2, 0.56M parameters). With only ~1,230 training stories the model overfits quickly:
words seen once become UNK (min_count=2), dropout is 0.2 and weight decay 0.1, and the checkpoint
is selected by the lowest validation window loss.
"""

from configs import default


def get_config():
    c = default.get_config()
    c.data.source = "file"
    c.data.path = "../shared/data/storycloze_val_2016.csv"
    c.tokenizer.lowercase = True
    c.tokenizer.min_count = 2
    c.model.n_tokens = 16
    c.model.n_slices = 4
    c.model.dx = 16
    c.model.dt = 8
    c.model.n_heads = 2
    c.model.n_layers = 2
    c.model.dropout = 0.2
    c.optim.learning_rate = 1e-3
    c.optim.warmup_steps = 50
    c.optim.weight_decay = 0.1
    c.batch_size = 32
    c.num_steps = 800
    c.log_every = 50
    c.eval_every = 100
    c.checkpoint_every = 100
    c.keep_checkpoints = 2
    c.compact_buckets = 8  # only positions whose input or target is not PAD (docs/performance.md)
    return c
