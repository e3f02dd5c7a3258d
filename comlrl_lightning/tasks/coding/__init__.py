"""Cooperative coding on HumanEval: problems, prompts, the sandboxed reward, test feedback."""
