"""Data: adapters that turn datasets into images, OOD masks and Cityscapes trainIds."""
