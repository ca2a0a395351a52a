"""Helpers of the SGLang-side tests: a small real HTTP server process to manage."""
