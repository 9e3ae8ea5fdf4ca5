"""One module per figure of issue 6; each ``measure(settings)`` returns its table rows."""
