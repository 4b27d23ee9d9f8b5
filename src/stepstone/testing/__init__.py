"""Testing helpers for users' own tests: scripted models, the store conformance suite."""

__all__: list[str] = []
