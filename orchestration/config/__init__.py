"""The run's typed config tree: its schema, YAML files and overrides, one-line errors, and the generated reference.

Importing this package never imports Ray, JAX or an engine, so every CLI reports a config mistake in milliseconds.
"""
