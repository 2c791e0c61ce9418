"""Reading a model's reply: tool calls and reasoning separated from the content, as it streams."""
