"""The checks: the registry (names, directions, default thresholds by quant class), threshold
resolution (marker > CLI > ini > default), and one module per family turning a comparison into a
CheckResult with its table, worst positions and hint."""
