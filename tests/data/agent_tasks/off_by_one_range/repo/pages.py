def page_count(items, per_page):
    """How many pages `items` fill when each page holds `per_page` of them."""
    return len(items) // per_page
