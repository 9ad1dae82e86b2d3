"""What results say: the regression gate, history and exports."""
