"""Drop-in surfaces of other kernel libraries, served by mqa-core's choice of provider.

``from mqa_core.compat import deep_gemm`` gives DeepGEMM's indexer functions (names, argument order,
defaults); see ``docs/compat-deep-gemm.md`` for what still differs. Importing this package imports
nothing heavy; each surface imports torch when it is imported itself.
"""
