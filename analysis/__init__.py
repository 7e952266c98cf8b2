"""Privacy analysis for PATE: the Rényi-DP core, the aggregators' data-dependent bounds, smooth
sensitivity, DP-SGD's sampled Gaussian and the Bayesian accountant.

numpy/scipy only; nothing here imports torch or the rest of the project. Formulas are restated in
``docs/privacy-math.md`` of the design notes, with their sources given in each docstring.
"""
