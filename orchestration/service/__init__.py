"""A Tinker-API training service over aha's learner and engines (`aha tinker`): your own loop, written against the
official SDK, drives the same learner primitives and engine fleet as `aha train` (docs/tinker.md)."""
