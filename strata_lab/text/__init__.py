"""Text -> token ids: the tokenizer, chat templates and message validation, and the reply-reusing encoder, and
the UTF-8-safe id stream (with the one drained-ids rule) shared by the server and the replay.

This stage imports nothing else of strata_lab: everything above it (engine, dump, replay, server) builds on
its ids.
"""
