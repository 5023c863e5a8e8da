"""The `diloco-chaos` command line: the layer above `harness/` (running and judging) and
`reports/` (rendering), the one place that uses both (docs/ARCHITECTURE.md)."""
