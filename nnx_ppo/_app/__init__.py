"""The application layer behind ``nnx-ppo`` (:mod:`nnx_ppo.cli`): commands,
training and evaluation runs, progress display. Not a stable API."""
