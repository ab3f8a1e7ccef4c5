"""accelkit-testplug-future: a plugin built for accelkit plugin API 2.0, made for accelkit's tests.
The registry must refuse it, naming both API versions, before importing its backend or probe."""
