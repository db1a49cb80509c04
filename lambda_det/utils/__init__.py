"""Small utilities the other rooms share: files written atomically, write errors in one line,
text files that are not text named."""
