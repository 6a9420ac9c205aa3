"""The small vocabulary of labels, words and instructions (a tiny model with a small BPE)."""

BUTTONS = (
    "Save",
    "Open",
    "Send",
    "Print",
    "Copy",
    "Undo",
    "Apply",
    "Reset",
    "Close",
    "Next",
    "Back",
    "Help",
    "Find",
    "Edit",
    "Stop",
    "Play",
)
COLOURS = ("Red", "Blue", "Green", "Pink", "Gray", "Gold", "Black", "White", "Cyan", "Lime")
FIELDS = ("Name", "City", "Mail", "Code", "Note", "Town", "Tag", "Key")
WORDS = (
    "cat",
    "dog",
    "sun",
    "sky",
    "box",
    "cup",
    "pen",
    "map",
    "jam",
    "fox",
    "owl",
    "bee",
    "ant",
    "hat",
    "egg",
    "bus",
)
LISTS = {
    "Fruit": ("Apple", "Pear", "Plum", "Fig", "Kiwi", "Lime", "Date", "Peach"),
    "Day": ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"),
    "Pet": ("Cat", "Dog", "Fish", "Bird", "Frog", "Duck", "Hen"),
}
TABS = ("Home", "Mail", "View", "Tools", "Files", "Shop")
TITLES = ("Notes", "Tasks", "Photos", "Music", "Post", "Shop", "Docs", "Forms")
DIALOGS = ("Save changes?", "Quit now?", "Allow access?", "Print page?", "Keep file?")
ANSWERS = (("OK", "Cancel"), ("Yes", "No"))
