"""Model FLOP utilisation for the training log: the train step's analytic FLOPs
(``rank4jax.models.flops``) per second and device, and their fraction of the device's dense
bfloat16 peak where it is known (Levanter logs this as ``mfu``; PaLM's definition: model FLOPs, not
the hardware's, so rematerialisation or a skipped PAD position does not count)."""

from __future__ import annotations

# Dense bfloat16 peak TFLOP/s per device, from the vendors' datasheets; matched as a substring of
# jax's device_kind, first match wins (so "H100 PCIe" comes before "H100").
BF16_PEAK_TFLOPS = (
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
)


def bf16_peak_flops(device) -> float | None:
    """The device's dense bfloat16 peak in FLOP/s, or None when it is not in the table (CPUs)."""
    kind = getattr(device, "device_kind", "")
    for name, tflops in BF16_PEAK_TFLOPS:
        if name in kind:
            return tflops * 1e12
    return None


def utilization(windows_per_s: float, flops_per_window: int | None, n_devices: int, peak: float | None) -> dict:
    """``model_flops_per_s_per_device`` and, with a known peak, ``mfu``; {} without a FLOP count."""
    if flops_per_window is None:
        return {}
    per_device = windows_per_s * flops_per_window / n_devices
    return {"model_flops_per_s_per_device": per_device} | ({"mfu": per_device / peak} if peak else {})
