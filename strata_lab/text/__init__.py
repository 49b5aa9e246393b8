"""Text -> token ids: the tokenizer, chat templates and message validation, and the reply-reusing encoder.

This stage imports nothing else of strata_lab: everything above it (engine, dump, replay, server) builds on
its ids.
"""
