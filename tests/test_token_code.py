"""The flat token code (``model.token_code="flat"``, an ablation of the fibre factorisation): a free
vector per token laid on the (dx, dt) fiber with the paper's position codes, and a readout tied to it;
exact values on a tiny case, the loss from the factors equal to the loss from the logits, a run end to
end, and the ablation's parameter match."""

import copy

import jax
import jax.numpy as jnp
import numpy as np

import rank4jax
from configs import rocstories
from rank4jax.models.family import run_param_count
from rank4jax.models.rank4.codes import apply_embedding
from rank4jax.models.rank4.losses import code_loss_sums, window_loss_sums
from rank4jax.models.rank4.model import hidden_states
from rank4jax.runs import load_run
from rank4jax.training.loop import train
from tests.helpers import hand_position_tables, numpy_params, rank4_cfg, tiny_config


def _cfg(**kw):
    return rank4_cfg(**(dict(vocab_size=6, n_tokens=2, n_slices=2, dx=2, dt=3, n_layers=1) | kw), token_code="flat")


def test_the_flat_input_tensor_by_hand():
    """X[b, x, t, n, q] = E[tok, n·dt + q] + P[x, n] + R[x + t, q], every entry by hand."""
    cfg = _cfg()
    table = np.arange(36, dtype=np.float64).reshape(6, 6) / 10.0
    table[0] = 0.0
    p_tab, r_tab, tok_btn = hand_position_tables()  # P[x][n], R[x+t][q], tok[b, t, x] (B=1, T=2, N=2)
    expected = np.zeros((1, 2, 2, 2, 3))
    for x in range(2):
        for t in range(2):
            for n in range(2):
                for q in range(3):
                    expected[0, x, t, n, q] = table[tok_btn[0, t, x], n * 3 + q] + p_tab[x][n] + r_tab[x + t][q]
    with jax.enable_x64(True):
        got = apply_embedding({"tok": jnp.asarray(table)}, jnp.asarray(tok_btn).transpose(0, 2, 1), cfg)
        np.testing.assert_allclose(np.asarray(got), expected, rtol=0, atol=1e-14)


def test_the_loss_from_the_tied_table_equals_the_loss_from_the_logits():
    """The training path's target logit (Y·E[target], no index into the logits) gives the sums of the
    logits' own cross-entropy, and the logits are Y·Eᵀ (float64)."""
    with jax.enable_x64(True):
        cfg = _cfg(vocab_size=13, n_tokens=3, n_slices=2)
        params = numpy_params(rank4jax.init_params, cfg, jnp.float64)
        windows = np.random.default_rng(0).integers(0, 13, (4, 3, 3)).astype(np.int32)

        @jax.jit  # one program: eagerly, every primitive would compile on its own
        def both_paths(params, windows):
            inputs, targets = windows[:, :-1], windows[:, 1:]
            logits = rank4jax.forward(params, inputs, cfg)  # (B, N, T, V)
            y = hidden_states(params, inputs, cfg)  # (B, P, D)
            tgt = jnp.swapaxes(targets, 1, 2).reshape(4, 6)
            last = jnp.broadcast_to(jnp.arange(6) % 2 == 1, tgt.shape)
            return logits, y, code_loss_sums(params, y, tgt, last, cfg.tokens), window_loss_sums(logits, targets)

        logits, y, got, want = both_paths(params, windows)
        by_hand = np.einsum("bpd,vd->bpv", np.asarray(y), np.asarray(params["embed"]["tok"]))
        np.testing.assert_allclose(np.asarray(logits).reshape(4, 6, 13), by_hand, rtol=1e-12, atol=1e-12)
        for key in ("window_ce_sum", "last_slice_ce_sum", "window_tokens", "last_slice_tokens", "correct_tokens"):
            np.testing.assert_allclose(float(got[key]), float(want[key]), rtol=1e-12, err_msg=key)


def test_a_flat_run_trains_resumes_and_loads(tmp_path):
    config = tiny_config(**{"model.token_code": "flat"})
    summary = train(config, str(tmp_path))
    run = load_run(str(tmp_path))
    assert summary["step"] == 6 and run.model_cfg.token_code == "flat"
    assert set(run.params) == {"embed", "layers", "final_ln"} and set(run.params["embed"]) == {"tok"}
    resumed = train(tiny_config(num_steps=8, **{"model.token_code": "flat"}), str(tmp_path))  # from step 6
    assert resumed["step"] == 8 and load_run(str(tmp_path), "latest").model_cfg.token_code == "flat"
    from rank4jax.records import read_metrics

    assert [r["step"] for r in read_metrics(str(tmp_path))["validation"]] == [2, 4, 6, 8]  # 6 not trained twice


def test_the_ablations_parameter_match():
    """At V = 14,171 (the ladder's ROCStories vocabulary) the flat code at D = 32 (dx = 8, dt = 4) is
    within 10 % of the paper's model at D = 64 (dx = dt = 8); at D = 64 it has 2.2 times as many."""
    base = rocstories.get_config()

    def count(dx, dt, code):
        config = copy.deepcopy(base)
        config.model.dx, config.model.dt, config.model.token_code = dx, dt, code
        return run_param_count(config, 14_171)

    paper = count(8, 8, "outer")
    assert paper == 456_072
    assert abs(count(8, 4, "flat") / paper - 1) < 0.10
    assert count(8, 8, "flat") / paper > 2
