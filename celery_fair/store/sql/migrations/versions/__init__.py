"""The SQL store's revisions: frozen history, each naming its tables explicitly."""
