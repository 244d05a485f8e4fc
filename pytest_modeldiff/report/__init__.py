"""Output: terminal tables and failure messages, JSON and CSV, Markdown and HTML pages, SVG plots and baselines."""
