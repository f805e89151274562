"""The (q dtype, k dtype) pairs AITER's FlyDSL entry takes, per arch, as it takes them.

Read from ROCm/aiter (never copied):

- gfx942: ``flydsl_fp8_mqa_logits`` asserts each of Q and KV is e4m3fnuz or e4m3fn and converts each
  e4m3fn operand on its own: the kernel patches e4m3fn's -0 (0x80, fnuz's NaN) to +0 in registers and
  the host doubles ``kv_scales`` once per e4m3fn operand (``convert_q_fn``/``convert_kv_fn``,
  ``scale_mul``): ``aiter/ops/flydsl/kernels/fp8_mqa_logits.py`` at tag v0.1.18 (``d6de77692f``; the
  entry came with ROCm/aiter#3913, ``0571aeac7b``) lines 605-617, the same in
  ``kernels/mqa_logits/fp8_mqa_logits.py`` at v0.1.20.post1 (``de07f3885e``) lines 499-511.
  AITER's own test sweeps q in {fnuz, fn} with kv fnuz (``op_tests/flydsl_tests/
  test_flydsl_fp8_mqa_logits.py`` at v0.1.20.post1, lines 177-189) and a later version adds kv fn
  with q in {fnuz, fn} (``test_flydsl_fp8_mqa_logits_fn_kv``). All four pairs therefore go in as
  they are: converting here as well would convert twice.
- gfx950: the CDNA4 scaled MFMA atoms read OCP e4m3fn only. The later entry
  (``aiter/ops/flydsl/fp8_mqa_logits_kernels.py``, the gfx950 path of ROCm/aiter#4538) asserts
  ``Q.dtype == KV.dtype == float8_e4m3fn`` there, and AITER's own dispatcher accepts the FlyDSL
  backend on gfx950 only for that pair (``flydsl_supports``). An earlier gfx950 build of the same path
  (branch ``users/vpietila/gfx950-fp8-mqa-logits``, 2026-08-18) did not assert, and would read fnuz
  bytes as e4m3fn: the adapter refuses other pairs itself.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["DECLARED", "FN", "FNUZ", "refusal"]

FN = "float8_e4m3fn"
FNUZ = "float8_e4m3fnuz"

#: What the spec declares: arch -> the (q, k) dtype-name pairs the entry takes unconverted.
DECLARED: Mapping[str, frozenset[tuple[str, str]]] = {
    "gfx942": frozenset({(FNUZ, FNUZ), (FN, FNUZ), (FN, FN), (FNUZ, FN)}),
    "gfx950": frozenset({(FN, FN)}),
}


def refusal(arch: str, q_dtype: str, k_dtype: str) -> str | None:
    """None when AITER's entry takes ``(q_dtype, k_dtype)`` on ``arch``, else why not."""
    pairs = DECLARED.get(arch, frozenset())
    if (q_dtype, k_dtype) in pairs:
        return None
    said = ", ".join(f"({q}, {k})" for q, k in sorted(pairs)) or "nothing"
    return (f"AITER's FlyDSL entry on {arch} takes (q, k) dtypes {said}; "
            f"got ({q_dtype}, {k_dtype})")
