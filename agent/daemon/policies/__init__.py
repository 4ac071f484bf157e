"""The policies in force: the policy directory's files and those applied through the API,
each change committed through one path."""
