"""Numerics backends: quantized-format codecs (formats) and a reference MoE that runs anywhere (emulation)."""
