"""The PyTorch peer's train step (``../shared/bench/torch_rank4.py``: its model class, AdamW and
step body, unchanged) timed on windows read from a .npy file instead of its own random ones, so
both frameworks can be timed on the same real sentences.

    python bench/torch_peer_windows.py PEER WINDOWS.npy --dx 16 --dt 8 --H 2 --L 2 --V 4000 --steps 10 [--device cuda]

``--device cuda`` moves the peer's model and windows to the GPU (its step syncs every step through
``loss.item()``); PyTorch's float32 matmuls there are full float32 unless TF32 is switched on.

``--forward`` times the eval-mode forward and loss under ``torch.no_grad()`` instead (what the
rank4jax eval step computes).

prints one line: torch_windows_per_s=<float>
"""

import argparse
import importlib.util
import time

import numpy as np
import torch
import torch.nn.functional as F


def load_peer(path: str):
    """The peer's module (its ``Rank4`` model class), loaded from its file."""
    spec = importlib.util.spec_from_file_location("torch_rank4", path)
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    return peer


def peer_step(m, opt, win):
    """The peer's train step on windows ``win`` (B, T+1, N), verbatim; returns the loss."""

    def step():
        logits = m(win[:, :-1])
        tgt = win[:, 1:].transpose(1, 2)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()

    return step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("peer")
    ap.add_argument("windows")
    for k, v in dict(dx=16, dt=8, H=2, L=2, V=4000, steps=20, warmup=3).items():
        ap.add_argument(f"--{k}", type=int, default=v)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--forward", action="store_true", help="time the eval-mode forward and loss instead")
    a = ap.parse_args()
    peer = load_peer(a.peer)
    torch.manual_seed(0)
    win = torch.from_numpy(np.load(a.windows).astype(np.int64)).to(a.device)  # (B, T+1, N)
    batch, n_states, n_tokens = win.shape
    m = peer.Rank4(a.V, a.dx, a.dt, a.H, a.L, n_tokens, n_states - 1).to(a.device)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-4, weight_decay=0.01)

    step = peer_step(m, opt, win)

    def forward():  # the eval step's counterpart: the eval-mode loss, no gradient
        with torch.no_grad():
            logits = m(win[:, :-1])
            tgt = win[:, 1:].transpose(1, 2)
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=0).item()

    run = forward if a.forward else step
    if a.forward:
        m.eval()
    for _ in range(a.warmup):
        run()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        run()
    print(f"torch_windows_per_s={batch * a.steps / (time.perf_counter() - t0):.2f}")


if __name__ == "__main__":
    main()
