"""Plumbing every step's faces share (the Argo template helpers, output-parameter files, the
backend/namespace options); steps import it, it never imports a step or the CLI layer."""
