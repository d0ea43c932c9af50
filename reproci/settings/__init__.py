"""A run's settings: every option of ``reproci run`` declared once (``declared``), the
``reproci.yaml`` that sets them, the frozen ``RunOptions`` built from both, and the models they name."""
