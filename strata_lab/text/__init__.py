"""Text: the tokenizer, chat templates and the UTF-8-safe id stream shared by the server and the replay."""
