"""Backends that ship with accelkit."""
