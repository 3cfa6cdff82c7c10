"""What a person reads: Markdown, self-contained HTML and plots of a sweep, a capacity search and a
comparison; the verdict lines and exit status every report shares."""
