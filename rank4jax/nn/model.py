"""The whole rank-4 model as a Flax NNX module (SPEC §2–§4, §11), over ``rank4jax``'s pure functions.

Axes: B batch, T input slices, N tokens per state, dx/dt fibers, D = dx·dt, V vocabulary.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from rank4jax.errors import ConfigError
from rank4jax.models import common
from rank4jax.models.rank4.config import Rank4Config
from rank4jax.models.rank4.model import attention_maps, init_params, key_padding_mask
from rank4jax.nn.layers import FiberLayerNorm, Rank4Block, Rank4Embedding, Rank4Readout


class Rank4Model(nnx.Module):
    """The paper's model: embedding → L Pre-LN rank-4 blocks → final LayerNorm → tied readout.

    ``Rank4Model(cfg, rngs=nnx.Rngs(seed))`` initialises as ``rank4jax.init_params(rngs.params(), cfg)``
    (SPEC §5); ``Rank4Model.from_params(params, cfg)`` and ``model.to_params()`` convert exactly both
    ways. ``model(inputs)``: inputs (B, T, N) token ids = S(0..T−1) → logits (B, N, T, V), the values of
    ``rank4jax.forward(model.to_params(), inputs, cfg)``. In train mode (``model.train()``) dropout runs
    and ``rng`` is required: ``model(inputs, rng=key)`` equals ``forward(..., train=True, rng=key)``."""

    def __init__(self, cfg: Rank4Config, *, rngs: nnx.Rngs | None = None, dtype=jnp.float32, params=None):
        if params is None:
            if rngs is None:
                raise ValueError("pass rngs=nnx.Rngs(seed) to initialise the model, or use Rank4Model.from_params")
            params = init_params(rngs.params(), cfg, dtype)
        common.check_params(params, "rank4", "Rank4Model")
        if cfg.token_code != "outer" or cfg.attention_grid != "joint":
            raise ConfigError(
                "rank4jax.nn holds the paper's model (token_code='outer', attention_grid='joint'), not "
                f"{cfg.token_code!r} and {cfg.attention_grid!r}"
            )
        if len(params["layers"]) != cfg.n_layers:
            raise ConfigError(f"the parameters have {len(params['layers'])} layers; the config says {cfg.n_layers}")
        self.cfg, self.deterministic = cfg, True
        self.embed = Rank4Embedding.from_params(params["embed"], cfg)
        self.layers = nnx.List([Rank4Block.from_params(layer, cfg) for layer in params["layers"]])
        self.final_ln = FiberLayerNorm(cfg.dx, cfg.dt, params=params["final_ln"])
        self.readout = Rank4Readout(cfg.vocab_size, cfg.dx, cfg.dt, params=params["readout"])

    @classmethod
    def from_params(cls, params: dict, cfg: Rank4Config) -> Rank4Model:
        """The module over ``params`` (``rank4jax.init_params``'s layout, e.g. a trained run's)."""
        return cls(cfg, params=params)

    def to_params(self) -> dict:
        """The functional parameter tree: ``rank4jax.forward(model.to_params(), inputs, model.cfg)``."""
        return {
            "embed": self.embed.to_params(),
            "readout": self.readout.to_params(),
            "layers": [layer.to_params() for layer in self.layers],
            "final_ln": self.final_ln.to_params(),
        }

    def __call__(self, inputs: jax.Array, *, rng: jax.Array | None = None) -> jax.Array:
        cfg, batch = self.cfg, inputs.shape[0]
        chex.assert_shape(inputs, (batch, cfg.n_slices, cfg.n_tokens))
        train = not self.deterministic
        if train and cfg.dropout > 0.0 and rng is None:
            raise ValueError("Rank4Model in train mode with dropout > 0 needs rng=key")
        keys = common.window_keys(rng, batch)  # one dropout key per window
        x = self.embed(inputs)  # X (B, N, T, dx, dt)
        key_mask = key_padding_mask(inputs).reshape(x.shape[:3])  # (B, N, T): a key where the token is not PAD
        for index, block in enumerate(self.layers):
            x = block(x, key_mask, rng=common.fold_in_keys(keys, index), deterministic=not train)  # (B, N, T, dx, dt)
        y = self.final_ln(x)  # Y (B, N, T, dx, dt)
        logits = self.readout(y, self.embed.sem.get_value())  # (B, N, T, V)
        chex.assert_shape(logits, (batch, cfg.n_tokens, cfg.n_slices, cfg.vocab_size))
        return logits

    def attention_maps(self, inputs: jax.Array) -> list[jax.Array]:
        """Eval-mode attention weights of every layer, each (B, H, N, T, N, T): [b, h, x, t, x′, t′]."""
        return attention_maps(self.to_params(), inputs, self.cfg)


def from_run(run) -> Rank4Model:
    """A trained rank-4 run (``rank4jax.load_run(workdir)``) as a :class:`Rank4Model`."""
    if not isinstance(run.model_cfg, Rank4Config):
        raise ConfigError(f"rank4jax.nn.from_run takes a rank-4 run; this run's family is {run.family.name}")
    params = jax.tree.map(jnp.asarray, run.params)
    return Rank4Model.from_params(params, run.model_cfg)
