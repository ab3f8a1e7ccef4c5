"""accelkit-testplug-badprobe: a plugin whose device probe raises, made for accelkit's tests. The
registry must quarantine it at stage "probe", with the traceback, and list every other device."""
