"""Models as the daemon knows them: creating one from a request, reading one back."""
