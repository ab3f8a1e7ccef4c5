"""accelkit-testplug-broken: a plugin whose descriptor module raises on import, made for accelkit's
tests. The registry must quarantine it (stage "load", with the traceback) and carry on."""
