"""splm-probe: the SPLM causal-leak probe (seed 004's future-perturbation probe).

    splm-probe                  (or: python -m rank4jax.experiments.splm_probe)

A fresh float64 model (V = 64, d = 32, L = 4) reads two streams of length 48 that are equal before
slot 24 and different from 24 on; the largest absolute change of any logit before slot 24 must be
exactly 0.0, for both potentials, through the forward pass and through the training loss's forward
(the family's ``train=True`` path). The negative control removes the stop-gradient on h inside ξ
for the MLP potential, whose force comes from autodiff: the future then leaks into the past through
∇_h Σ_t V(ξ_t(h), h_t), and the probe must see it. Exits 1 if any check fails.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np

from rank4jax.models import splm

LENGTH, CUT, VOCAB = 48, 24, 64


_forward = jax.jit(splm.forward, static_argnums=2)  # one jit object: a program per config, not per call


def _model_and_streams(potential: str, stop_gradient: bool = True, seed: int = 0):
    """A fresh float64 model and two streams (LENGTH,) equal before CUT and different at every slot from
    CUT on. Call inside ``jax.enable_x64``."""
    cfg = splm.SPLMConfig(
        vocab_size=VOCAB, n_tokens=8, n_slices=3, dx=4, dt=8, n_layers=4,
        potential=potential, mlp_hidden=32, xi_stop_gradient=stop_gradient,
    )  # fmt: skip
    params = jax.jit(splm.init_params, static_argnums=(1, 2))(jax.random.key(seed), cfg, jnp.float64)  # one program
    rng = np.random.default_rng(seed)
    a = rng.integers(4, VOCAB, size=LENGTH)
    b = a.copy()
    b[CUT:] = (a[CUT:] - 4 + rng.integers(1, VOCAB - 4, size=LENGTH - CUT)) % (VOCAB - 4) + 4
    return cfg, params, jnp.asarray(a), jnp.asarray(b)


def probe(potential: str, stop_gradient: bool = True, seed: int = 0) -> float:
    """max |logit(a) − logit(b)| over slots < CUT for streams a, b equal before CUT."""
    with jax.enable_x64(True):
        cfg, params, a, b = _model_and_streams(potential, stop_gradient, seed)
        logits, _ = _forward(params, jnp.stack([a, b]), cfg)
        logits = np.asarray(logits)  # numpy from here: no program per operation
        return float(np.max(np.abs(logits[0, :CUT] - logits[1, :CUT])))


def train_path_probe(potential: str, seed: int = 0) -> float:
    """The same probe through the training objective restricted to slots < CUT: the prefix loss must
    not depend on the suffix, and neither may its gradient."""
    with jax.enable_x64(True):
        cfg, params, a, b = _model_and_streams(potential, seed=seed)

        def prefix_loss(p, x):
            logits, v = splm.forward(p, x[None], cfg)
            logp = jax.nn.log_softmax(logits[0, : CUT - 1])
            ce = -jnp.mean(jnp.take_along_axis(logp, x[1:CUT, None], axis=-1))
            return ce + cfg.lambda_v * jnp.mean(v[0, :CUT] ** 2)

        grad = jax.jit(jax.value_and_grad(prefix_loss))
        (la, ga), (lb, gb) = grad(params, a), grad(params, b)
        leaves = zip(jax.tree.leaves(ga), jax.tree.leaves(gb), strict=True)
        changes = [float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in leaves]
        return max([abs(float(la) - float(lb))] + changes)


def main(argv=None) -> int:
    del argv
    failed = []
    for potential in ("gaussian", "mlp"):
        for name, value in (("forward", probe(potential)), ("train loss + gradient", train_path_probe(potential))):
            ok = value == 0.0
            failed += [] if ok else [f"{potential} {name}"]
            print(f"{potential:8s} {name:22s} max |change before slot {CUT}| = {value!r}  {'ok' if ok else 'LEAK'}")
    control = probe("mlp", stop_gradient=False)
    ok = control > 0.0
    failed += [] if ok else ["negative control"]
    print(
        f"mlp      without stop-gradient   max |change before slot {CUT}| = {control:.3e}  "
        f"{'ok (the probe sees the leak)' if ok else 'FAIL: the probe cannot fail'}"
    )
    print("causal-leak probe passed" if not failed else f"FAILED: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
