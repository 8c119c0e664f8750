"""Reference examples for Bastion."""
