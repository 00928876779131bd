"""GPU acceptance checks: ``python -m benchmarks.gpu.smoke`` (checks.py holds the checks)."""
