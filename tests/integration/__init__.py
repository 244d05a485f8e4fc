"""The plugin as a user meets it: pytester runs, the command line, compare(), the README's examples."""
