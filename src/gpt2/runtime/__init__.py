"""What every layer may use: device and dtype resolution, atomic file writes."""
