"""Every built-in selector with and without client failures on the digits-quick setting."""
