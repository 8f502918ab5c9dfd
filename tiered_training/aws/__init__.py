"""The commands that call AWS: the session and clients (built in one place), start, runs, the run
list and preflight. boto3 is imported when a command needs it."""
