"""FLOP/s and model FLOP utilisation for the training log, two ways (README "Training log"):

- ``mfu``: the FLOPs the compiled train steps really ran (XLA's cost analysis of each executable,
  ``engine.programs.CompiledStep``: forward, backward and the optimiser's update; every microbatch of
  a gradient accumulation; a compact or trimmed batch skips the PAD positions) per device
  and second, over the device's dense peak **in the run's compute dtype** (``compute_dtype``: bf16
  against the bf16 peak, float32 against the float32 peak), where that peak is known;
- ``analytic_mfu``: the model's analytic FLOPs over full-width windows (``rank4jax.models.flops``,
  PaLM's "model FLOPs": a skipped PAD position still counts, so a layout that skips work shows above
  the arithmetic it does) over the same peak; ``analytic_flops_per_s_per_device`` beside it.

No peak is known for CPUs: there the log carries the FLOP/s without either MFU."""

from __future__ import annotations

# Dense peak TFLOP/s per device and compute dtype, from the vendors' datasheets (float32: the
# non-tensor-core rate; TPUs run float32 matmuls as several bf16 passes, so no float32 peak is given
# for them). Matched as a substring of jax's device_kind, first match wins ("H100 PCIe" before "H100").
PEAK_TFLOPS = {
    "bfloat16": (
        ("H200", 989.0),
        ("H100 PCIe", 756.0),
        ("H100", 989.0),
        ("A100", 312.0),
        ("L40S", 362.0),
        ("L4", 121.0),
        ("A10G", 70.0),
        ("TPU v6", 918.0),
        ("TPU v5 lite", 197.0),
        ("TPU v5", 459.0),
        ("TPU v4", 275.0),
        ("TPU v3", 123.0),
    ),
    "float32": (
        ("H200", 67.0),
        ("H100 PCIe", 51.0),
        ("H100", 67.0),
        ("A100", 19.5),
        ("L40S", 91.6),
        ("L4", 30.3),
        ("A10G", 31.2),
    ),
}


def peak_flops(device, dtype: str = "bfloat16") -> float | None:
    """The device's dense peak in FLOP/s in ``dtype``, or None when it is not in the table (CPUs)."""
    kind = getattr(device, "device_kind", "")
    for name, tflops in PEAK_TFLOPS.get(dtype, ()):
        if name in kind:
            return tflops * 1e12
    return None


def bf16_peak_flops(device) -> float | None:
    """The device's dense bfloat16 peak in FLOP/s, or None when it is not in the table (CPUs)."""
    return peak_flops(device, "bfloat16")


def utilization(
    windows_per_s: float, analytic_flops_per_window: int | None, xla_flops_per_s_per_device: float, n_devices: int,
    peak: float | None,
) -> dict:  # fmt: skip
    """The log's FLOP figures: ``xla_flops_per_s_per_device`` and ``analytic_flops_per_s_per_device``
    (without an analytic count, none), and with a known ``peak`` (the compute dtype's) ``mfu`` and
    ``analytic_mfu``."""
    record = {"xla_flops_per_s_per_device": xla_flops_per_s_per_device}
    if analytic_flops_per_window is not None:
        record["analytic_flops_per_s_per_device"] = windows_per_s * analytic_flops_per_window / n_devices
    if peak:
        record["mfu"] = xla_flops_per_s_per_device / peak
        if "analytic_flops_per_s_per_device" in record:
            record["analytic_mfu"] = record["analytic_flops_per_s_per_device"] / peak
    return record
