"""The regions a place belongs to, so that a question about Doha finds the Middle East sibling of a policy.

A more specific sibling document is named by what its title adds ("EU" in "EU Customs Clearance Procedure",
"Middle East" in "Middle East Hotel Cancellation Policy"). Questions rarely name the region; they name a
country or a city ("a Rotterdam import", "our Doha hotel", "a customer in Singapore"). :func:`region_words`
gives the region words of every place a text names, from a fixed table of countries, the UK's nations, US
states, Canadian provinces and large cities: general geography, not words chosen on any question set (a
Welsh city names "Wales" as well as "UK", so a Wales sibling of a UK policy is named by "Cardiff"; a large
city of the US, Canada or Australia names its state or province too, so "a patient in Toronto" names an
Ontario sibling and "San Diego" a California one). Places whose names are common English
words ("Chad", "Nice", "Reading", "Georgia" the state or the country) are left out.
"""

from __future__ import annotations

import re
from functools import lru_cache

_EU = ("eu", "europe", "european", "emea")
_EUROPE = ("europe", "european", "emea")
_UK = ("uk", "britain", "british", "europe", "european", "emea")
_ENGLAND = ("england", "english", *_UK)  # the UK's nations: a Scottish or Welsh sibling of a UK policy
_SCOTLAND = ("scotland", "scottish", *_UK)
_WALES = ("wales", "welsh", *_UK)
_GULF = ("middle", "east", "me", "mena", "gcc", "gulf", "emea")
_MIDDLE_EAST = ("middle", "east", "me", "mena", "emea")
_NORTH_AFRICA = ("africa", "african", "mena", "emea")
_AFRICA = ("africa", "african", "emea")
_APAC = ("apac", "asia", "asian", "pacific")
_ANZ = ("apac", "pacific", "anz", "oceania", "australasia")
_US = ("us", "usa", "na", "north", "america", "american", "americas")
_CANADA = ("canada", "canadian", "na", "north", "america", "americas")
_LATAM = ("latam", "latin", "america", "americas")

_COUNTRIES: dict[tuple[str, ...], tuple[str, ...]] = {
    ("austria", "belgium", "bulgaria", "croatia", "cyprus", "czechia", "czech republic", "denmark", "estonia",
     "finland", "france", "germany", "greece", "hungary", "ireland", "italy", "latvia", "lithuania", "luxembourg",
     "malta", "netherlands", "holland", "poland", "portugal", "romania", "slovakia", "slovenia", "spain",
     "sweden"): _EU,
    ("albania", "andorra", "belarus", "bosnia", "iceland", "kosovo", "liechtenstein", "moldova", "monaco",
     "montenegro", "north macedonia", "norway", "russia", "san marino", "serbia", "switzerland", "ukraine",
     "turkey", "türkiye"): _EUROPE,
    ("united kingdom", "great britain", "northern ireland"): _UK,
    ("england",): _ENGLAND,
    ("scotland",): _SCOTLAND,
    ("wales",): _WALES,
    ("united arab emirates", "uae", "saudi arabia", "qatar", "kuwait", "bahrain", "oman"): _GULF,
    ("israel", "jordan", "lebanon", "iraq", "iran", "yemen", "syria", "palestine"): _MIDDLE_EAST,
    ("egypt", "morocco", "algeria", "tunisia", "libya"): _NORTH_AFRICA,
    ("nigeria", "kenya", "south africa", "ghana", "ethiopia", "tanzania", "uganda", "rwanda", "senegal",
     "ivory coast", "cameroon", "angola", "mozambique", "zambia", "zimbabwe", "botswana", "namibia",
     "mauritius"): _AFRICA,
    ("china", "japan", "south korea", "korea", "taiwan", "hong kong", "macau", "mongolia", "singapore",
     "malaysia", "indonesia", "thailand", "vietnam", "philippines", "cambodia", "laos", "myanmar", "india",
     "pakistan", "bangladesh", "sri lanka", "nepal"): _APAC,
    ("australia", "new zealand", "fiji", "papua new guinea"): _ANZ,
    ("united states", "usa", "america"): _US,
    ("canada",): _CANADA,
    ("mexico", "brazil", "argentina", "chile", "colombia", "peru", "ecuador", "bolivia", "uruguay", "paraguay",
     "venezuela", "costa rica", "panama", "guatemala", "honduras", "el salvador", "nicaragua", "cuba",
     "dominican republic", "puerto rico", "jamaica"): _LATAM,
}

_CITIES: dict[tuple[str, ...], tuple[str, ...]] = {
    ("amsterdam", "rotterdam", "the hague", "utrecht", "eindhoven", "antwerp", "brussels", "ghent", "paris",
     "lyon", "marseille", "toulouse", "bordeaux", "lille", "strasbourg", "berlin", "hamburg", "munich",
     "frankfurt", "cologne", "düsseldorf", "dusseldorf", "stuttgart", "leipzig", "dresden", "bremen",
     "hanover", "nuremberg", "vienna", "salzburg", "madrid", "barcelona", "valencia", "seville", "bilbao",
     "lisbon", "porto", "rome", "milan", "naples", "turin", "florence", "venice", "genoa", "bologna", "athens",
     "dublin", "cork", "copenhagen", "aarhus", "stockholm", "gothenburg", "malmo", "malmö", "helsinki", "tallinn",
     "riga", "vilnius", "warsaw", "krakow", "kraków", "gdansk", "gdańsk", "wroclaw", "wrocław", "poznan",
     "poznań", "lodz", "łódź", "prague", "brno", "bratislava", "budapest", "bucharest", "sofia", "zagreb",
     "ljubljana", "luxembourg city", "valletta", "nicosia", "limassol"): _EU,
    ("oslo", "bergen", "zurich", "zürich", "geneva", "basel", "bern", "lausanne", "reykjavik", "istanbul",
     "ankara", "izmir", "kyiv", "kiev", "moscow", "belgrade", "sarajevo", "tirana", "minsk"): _EUROPE,
    ("london", "manchester", "birmingham", "liverpool", "leeds", "bristol", "newcastle", "sheffield", "nottingham",
     "southampton", "felixstowe", "ipswich", "dover", "heathrow", "gatwick", "oxford", "cambridge", "leicester",
     "coventry", "bradford", "brighton", "plymouth", "york", "norwich", "exeter"): _ENGLAND,
    ("glasgow", "edinburgh", "aberdeen", "dundee", "inverness", "stirling"): _SCOTLAND,
    ("cardiff", "swansea", "wrexham"): _WALES,
    ("belfast",): _UK,
    ("dubai", "abu dhabi", "sharjah", "riyadh", "jeddah", "dammam", "doha", "kuwait city", "manama",
     "muscat"): _GULF,
    ("tel aviv", "jerusalem", "haifa", "amman", "beirut", "baghdad", "tehran"): _MIDDLE_EAST,
    ("cairo", "alexandria", "casablanca", "marrakech", "rabat", "tunis", "algiers"): _NORTH_AFRICA,
    ("lagos", "abuja", "nairobi", "mombasa", "johannesburg", "cape town", "durban", "accra", "addis ababa",
     "dar es salaam", "kampala", "kigali", "dakar"): _AFRICA,
    ("beijing", "shanghai", "shenzhen", "guangzhou", "tianjin", "chengdu", "wuhan", "hangzhou", "tokyo",
     "osaka", "yokohama", "nagoya", "kyoto", "seoul", "busan", "taipei", "kaohsiung", "kuala lumpur", "penang",
     "jakarta", "surabaya", "bali", "bangkok", "phuket", "ho chi minh city", "saigon", "hanoi", "manila", "cebu",
     "mumbai", "delhi", "new delhi", "bangalore", "bengaluru", "chennai", "hyderabad", "kolkata", "pune",
     "karachi", "lahore", "dhaka", "colombo", "kathmandu"): _APAC,
    ("new south wales", "queensland", "tasmania", "sydney", "melbourne", "brisbane", "perth", "adelaide", "canberra", "auckland", "wellington",
     "christchurch"): _ANZ,
    ("new york", "new york city", "nyc", "los angeles", "chicago", "houston", "phoenix", "philadelphia",
     "san antonio", "san diego", "dallas", "san jose", "austin", "jacksonville", "san francisco", "columbus",
     "seattle", "denver", "boston", "detroit", "nashville", "memphis", "portland", "las vegas", "baltimore",
     "milwaukee", "atlanta", "miami", "orlando", "tampa", "minneapolis", "cleveland", "pittsburgh",
     "cincinnati", "st louis", "kansas city", "new orleans", "salt lake city", "newark", "jersey city",
     "long beach", "oakland", "sacramento", "charlotte", "raleigh", "honolulu", "anchorage", "savannah",
     "baton rouge"): _US,
    ("toronto", "montreal", "montréal", "vancouver", "calgary", "edmonton", "ottawa", "winnipeg", "quebec city",
     "halifax"): _CANADA,
    ("mexico city", "guadalajara", "monterrey", "cancun", "cancún", "são paulo", "sao paulo", "rio de janeiro",
     "brasília", "brasilia", "buenos aires", "santiago", "bogotá", "bogota", "medellín", "medellin", "lima",
     "quito", "montevideo", "caracas", "panama city", "san juan", "havana"): _LATAM,
}

_US_STATES = (
    "alabama", "alaska", "arizona", "arkansas", "california", "colorado", "connecticut", "delaware", "florida",
    "hawaii", "idaho", "illinois", "indiana", "iowa", "kansas", "kentucky", "louisiana", "maine", "maryland",
    "massachusetts", "michigan", "minnesota", "mississippi", "missouri", "montana", "nebraska", "nevada",
    "new hampshire", "new jersey", "new mexico", "north carolina", "north dakota", "ohio", "oklahoma", "oregon",
    "pennsylvania", "rhode island", "south carolina", "south dakota", "tennessee", "texas", "utah", "vermont",
    "virginia", "washington state", "west virginia", "wisconsin", "wyoming",
)
_CANADIAN_PROVINCES = ("ontario", "quebec", "british columbia", "alberta", "manitoba", "saskatchewan", "nova scotia",
                       "new brunswick", "newfoundland")  # fmt: skip


#: The state or province of a large city, where policies often differ by one (a California or Ontario
#: sibling of a national policy): the city names it as well as the country's regions.
_CITY_STATES: dict[str, tuple[str, ...]] = {
    "california": ("los angeles", "san diego", "san jose", "san francisco", "oakland", "sacramento", "long beach"),
    "new york": ("new york city", "nyc"),
    "illinois": ("chicago",), "texas": ("houston", "san antonio", "dallas", "austin"),
    "arizona": ("phoenix",), "pennsylvania": ("philadelphia", "pittsburgh"),
    "florida": ("jacksonville", "miami", "orlando", "tampa"), "ohio": ("columbus", "cleveland", "cincinnati"),
    "washington state": ("seattle",), "colorado": ("denver",), "massachusetts": ("boston",),
    "michigan": ("detroit",), "tennessee": ("nashville", "memphis"), "nevada": ("las vegas",),
    "maryland": ("baltimore",), "wisconsin": ("milwaukee",), "georgia": ("atlanta", "savannah"),
    "minnesota": ("minneapolis",), "missouri": ("st louis",), "louisiana": ("new orleans", "baton rouge"),
    "utah": ("salt lake city",), "new jersey": ("newark", "jersey city"), "north carolina": ("charlotte", "raleigh"),
    "hawaii": ("honolulu",), "alaska": ("anchorage",),
    "ontario": ("toronto", "ottawa"), "quebec": ("montreal", "montréal", "quebec city"),
    "british columbia": ("vancouver",), "alberta": ("calgary", "edmonton"), "manitoba": ("winnipeg",),
    "nova scotia": ("halifax",),
    "nsw": ("new south wales", "sydney"), "victoria": ("melbourne",), "queensland": ("brisbane",),
}
#: Words of a state's name that name nothing by themselves ("New" of "New Jersey" is no qualifier).
_GENERIC = frozenset({"new", "north", "south", "west", "east", "city", "state", "island", "british"})


def _state_words(state: str) -> tuple[str, ...]:
    words = tuple(w for w in state.split() if w not in _GENERIC)
    return words if len(words) < len(state.split()) else (state,)


def _table() -> dict[str, tuple[str, ...]]:
    table: dict[str, tuple[str, ...]] = {}
    for group in (_COUNTRIES, _CITIES):
        for names, regions in group.items():
            for name in names:
                table[name] = regions
    table.update({"south america": _LATAM, "latin america": _LATAM, "central america": _LATAM,
                  "north america": ("na", "north", "america", "americas")})  # not the United States alone
    table.update({state: (*_state_words(state), *_US) for state in _US_STATES})
    table.update({province: (*_state_words(province), *_CANADA) for province in _CANADIAN_PROVINCES})
    for state, cities in _CITY_STATES.items():
        for city in cities:
            table[city] = (*_state_words(state), *table[city])
    table["new york"] = (*_state_words("new york"), *_US)
    return table


PLACES: dict[str, tuple[str, ...]] = _table()
_PATTERN = re.compile(
    r"(?<![\w-])(" + "|".join(re.escape(p) for p in sorted(PLACES, key=len, reverse=True)) + r")(?![\w-])"
)


@lru_cache(maxsize=4096)
def region_words(text: str) -> frozenset[str]:
    """The region words ("eu", "emea", "apac", "middle", "east" ...) of the places ``text`` names (lower-cased
    words, matched whole; the longest name wins, so "new south wales" is not "wales")."""
    found: set[str] = set()
    for match in _PATTERN.finditer(text.lower()):
        found.update(PLACES[match.group(1)])
    return frozenset(found)
