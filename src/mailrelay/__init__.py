"""MailRelay: an SMTP server that turns accepted mail into signed JSON webhooks."""
