"""AZR's code tasks (deduction, abduction, induction) as PopuLoRA task components."""
