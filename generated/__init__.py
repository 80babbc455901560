"""Generated adapter packages (one per contract), written by `clockc compile`."""
