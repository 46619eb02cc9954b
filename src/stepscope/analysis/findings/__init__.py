"""Findings: rules that turn analyses into problems priced in step time, with evidence and one action."""
