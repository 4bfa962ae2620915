"""The whole rank-4 model as a Flax NNX module (SPEC §2–§4, §11), over ``rank4jax``'s pure functions.

Axes: B batch, T input slices, N tokens per state, dx/dt fibers, D = dx·dt, V vocabulary.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
from flax import nnx

from rank4jax.errors import ConfigError
from rank4jax.models import common
from rank4jax.models.rank4.config import Rank4Config
from rank4jax.models.rank4.model import attention_maps, forward, init_params
from rank4jax.nn.codes import Rank4Embedding, Rank4Readout, check_tokens
from rank4jax.nn.common import cast, compute_dtype, dropout_keys, dropout_stream
from rank4jax.nn.layers import FiberLayerNorm, Rank4Block


class Rank4Model(nnx.Module):
    """The paper's model: embedding → L Pre-LN rank-4 blocks → final LayerNorm → tied readout.

    ``Rank4Model(cfg, rngs=nnx.Rngs(params=0, dropout=1))`` initialises as
    ``rank4jax.init_params(rngs.params(), cfg)`` (SPEC §5) and keeps a dropout stream forked from
    ``rngs``; ``Rank4Model.from_params(params, cfg)`` and ``model.to_params()`` convert exactly both
    ways. It starts in training mode, as flax's modules do: after ``.eval()`` (or with
    ``deterministic=True``) it computes ``rank4jax.forward(model.to_params(), inputs, cfg)`` bit for
    bit; in training mode, with the key its stream draws (or the call's ``rngs``), ``forward(...,
    train=True, rng=key)``. ``dtype``: the compute dtype (bfloat16 computes as the trainer's
    ``compute_dtype="bfloat16"`` does), ``param_dtype`` the storage dtype."""

    def __init__(
        self,
        cfg: Rank4Config,
        *,
        deterministic: bool = False,
        dtype=None,
        param_dtype=jnp.float32,
        rngs: nnx.Rngs | None = None,
        params=None,
    ):
        if params is None:
            if rngs is None:
                raise ValueError("pass rngs=nnx.Rngs(seed) to initialise the model, or use Rank4Model.from_params")
            params = init_params(rngs.params(), cfg, param_dtype)
        common.check_params(params, "rank4", "Rank4Model")
        if cfg.token_code != "outer" or cfg.attention_grid != "joint":
            raise ConfigError(
                "rank4jax.nn holds the paper's model (token_code='outer', attention_grid='joint'), not "
                f"{cfg.token_code!r} and {cfg.attention_grid!r}"
            )
        _check_fits(params, jax.eval_shape(lambda: init_params(jax.random.key(0), cfg)))
        self.cfg, self.deterministic, self.dtype = cfg, deterministic, dtype
        self.rngs = nnx.data(dropout_stream(rngs))
        self.embed = Rank4Embedding.from_params(params["embed"], cfg, dtype=dtype)
        self.layers = nnx.List([Rank4Block.from_params(layer, cfg, dtype=dtype) for layer in params["layers"]])
        self.final_ln = FiberLayerNorm(cfg.dx, cfg.dt, dtype=dtype, params=params["final_ln"])
        self.readout = Rank4Readout(cfg.vocab_size, cfg.dx, cfg.dt, dtype=dtype, params=params["readout"])

    @classmethod
    def from_params(cls, params: dict, cfg: Rank4Config, **options) -> Rank4Model:
        """The module over ``params`` (``rank4jax.init_params``'s layout, e.g. a trained run's)."""
        return cls(cfg, params=params, **options)

    def to_params(self) -> dict:
        """The functional parameter tree: ``rank4jax.forward(model.to_params(), inputs, model.cfg)``."""
        return {
            "embed": self.embed.to_params(),
            "readout": self.readout.to_params(),
            "layers": [layer.to_params() for layer in self.layers],
            "final_ln": self.final_ln.to_params(),
        }

    def set_view(self, deterministic: bool | None = None):
        """``nnx.view(model, deterministic=...)``, as ``nnx.Dropout`` has it."""
        if deterministic is not None:
            self.deterministic = deterministic

    def __call__(
        self, inputs: jax.Array, *, deterministic: bool | None = None, rngs=None, slices_first: bool = False
    ) -> jax.Array:
        """inputs (B, T, N) token ids = S(0..T−1) → logits (B, N, T, V), ``rank4jax.forward``'s order;
        ``slices_first``: (B, T, N, V), the order of the targets S(1..T) (B, T, N), for an optax loss.
        ``deterministic`` over the module's; ``rngs`` (an ``nnx.Rngs``, a stream or a key) over its
        dropout stream. It runs ``rank4jax.forward`` over its parameters, in its compute dtype."""
        cfg = self.cfg
        check_tokens(inputs, cfg, "Rank4Model")
        batch, train = inputs.shape[0], not (self.deterministic if deterministic is None else deterministic)
        keys = dropout_keys(batch, rngs, self.rngs, "Rank4Model") if train and cfg.dropout > 0 else None  # (B,)
        params = self.to_params()
        params = cast(params, compute_dtype(self.dtype, *jax.tree.leaves(params)))
        logits = forward(params, inputs, cfg, train=keys is not None, rng=keys)  # (B, N, T, V)
        return jnp.swapaxes(logits, 1, 2) if slices_first else logits

    def attention_maps(self, inputs: jax.Array) -> list[jax.Array]:
        """Eval-mode attention weights of every layer, each (B, H, N, T, N, T): [b, h, x, t, x′, t′]."""
        return attention_maps(self.to_params(), inputs, self.cfg)


def _check_fits(params: dict, want: dict) -> None:
    """The parameters' arrays against the config's (``init_params``'s shapes): the first that differs."""
    got = {jax.tree_util.keystr(p): getattr(a, "shape", None) for p, a in jax.tree_util.tree_leaves_with_path(params)}
    for path, leaf in jax.tree_util.tree_leaves_with_path(want):
        name = jax.tree_util.keystr(path)
        if got.get(name, "absent") != leaf.shape:
            raise ConfigError(
                f"Rank4Model: the parameters' {name} is {got.get(name, 'absent')}; the config makes it {leaf.shape}"
            )
    if len(got) != len(jax.tree.leaves(want)):
        raise ConfigError(f"Rank4Model: the parameters hold arrays the config does not make: {sorted(got)[:3]}...")


def from_run(run) -> Rank4Model:
    """A trained rank-4 run (``rank4jax.load_run(workdir)``) as a :class:`Rank4Model` in eval mode (to
    study it; ``.train()`` and a ``rngs=`` at the call to train it on)."""
    if isinstance(run, str | os.PathLike):
        raise ConfigError(f"rank4jax.nn.from_run takes a loaded run: from_run(rank4jax.load_run({os.fspath(run)!r}))")
    if not isinstance(run.model_cfg, Rank4Config):
        raise ConfigError(f"rank4jax.nn.from_run takes a rank-4 run; this run's family is {run.family.name}")
    params = jax.tree.map(jnp.asarray, run.params)
    return Rank4Model.from_params(params, run.model_cfg, deterministic=True)
