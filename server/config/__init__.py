"""Configuration: one frozen pydantic model per scope (``ServerConfig``, ``ModelConfig``).

``settings`` defines ``ServerConfig``, ``model_settings`` ``ModelConfig`` (every model setting,
declared once) and the bounds; ``sources`` resolves them once from every source
(defaults < config.properties < YAML < environment < CLI flags, archive manifest for a model);
``properties`` parses TorchServe's format; ``lenient`` forgives its malformed values where
the default is the safe reading. Imports only ``torchbay.server.errors``; everything
else imports config, never the reverse.
"""
