"""Small utilities the other subpackages share: files written atomically, write errors in one line,
text files that are not text named, the defaults of the run settings both config systems have."""
