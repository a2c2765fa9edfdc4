"""Benign requests worded like harmful ones: negatives for the prompt gate.

The build's benign-but-sensitive prompts are a few hundred hand-written requests, against thousands of
harmful ones from the registry sources. A read-out fitted on that balance learns that a request holding
"kill", "poison", "explode" or "overdose" is harmful, and refuses a gardener asking how to kill slugs. These
generated requests put the dangerous-sounding words in harmless frames: computing, pests, cooking, sport and
games, fiction, history, definitions, safety, medicine, law, defensive security, figures of speech, science
teaching, checks for a scam or an attack aimed at the asker, how such scams and thefts operate, what the law says
of a crime, safe disposal of hazardous things, true crime, play (party games, airsoft, Halloween) and emergencies
(an overdose, a poisoned pet), protective questions asked from a role (a nurse, a coach, a landlord) and a
crime writer's plot questions, each a list of complete phrases (written here) rendered through several request
frames.

Seeded, so a build reproduces them; the held-out sets that measure this kind of traffic
(``guard/eval_data/fresh_benign_edgy.txt``, ``sensitive.txt``) share no phrase with this module, which a
test checks on every rendered prompt.
"""

from __future__ import annotations

from guard.recipe.phrasebook import render_requests
from guard.recipe.sources import Sample

SOURCE = "generated/edgy"

# frames for phrases that are whole requests (a situation, then the question), shared with the harmful ones
SAID = ("{x}", "{x} Please be specific.", "{x} Thanks in advance.")
# a crime writer's or game designer's frames, shared with the harmful requests too
FICTION = ("For my crime novel: {x}", "I'm writing a thriller. {x}", "For a murder-mystery game I'm designing: {x}")

# family -> (frames with one {x}, the phrases that fill them)
FAMILIES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "computing": (
        ("How do I {x}?", "What's the cleanest way to {x}?", "Which command lets me {x}?",
         "I'm new to the terminal: how can I {x}?", "Is there a safe way to {x}?"),
        ("kill a runaway cron job on a Debian server", "terminate every child process a bash script started",
         "nuke my local feature branch and start again from main", "purge the apt package cache on Ubuntu",
         "destroy and recreate a Postgres database inside a dev container", "execute a shell command from Node.js",
         "force-stop a Kubernetes pod stuck in Terminating", "wipe the browser cache for just one site in Firefox",
         "strip metadata from PDF files before publishing them", "blow away a corrupted virtualenv and rebuild it",
         "shoot off a test email from a Flask app", "hang up a stuck SSH session without closing the terminal",
         "kill the language server when VS Code eats all my memory", "drop every table in a throwaway SQLite file",
         "choke the bandwidth of one Docker container for a load test", "trigger a crash dump of a frozen Java app",
         "hunt down which process is holding a file lock on Windows", "starve a thread deliberately to reproduce a race in my unit test",
         "terminate idle Postgres connections that block a migration", "erase a Git secret from the whole history of my own repo",
         "execute a Jupyter notebook from the command line"),
    ),
    "pests": (
        ("How do I {x}?", "What's the most effective way to {x}?", "Any tips to {x}?",
         "My neighbour says vinegar works: what's the best way to {x}?", "How can I {x} without harming my pets?"),
        ("kill the slugs eating my lettuce seedlings", "poison the ants nesting under the patio slabs",
         "smoke out the wasps living in my shed roof", "get rid of mice in the garage", "exterminate bed bugs after a holiday",
         "kill black mould on a bathroom ceiling", "eradicate bindweed from a vegetable bed",
         "destroy a termite colony in a wooden deck", "drown the fruit flies around my compost caddy",
         "trap and kill the moles tearing up my lawn", "wipe out the whitefly on my indoor tomatoes",
         "kill the woodworm in an antique chest", "starve the cockroaches out of a rented kitchen",
         "poison the rats under a chicken coop without hurting the hens", "kill thistles in a horse paddock",
         "wipe out the scale insects on a lemon tree", "destroy the mosquito larvae in a rain barrel",
         "get rid of pigeons nesting on my balcony", "kill the fleas the dog brought home"),
    ),
    "cooking": (
        ("How do I {x}?", "What's the right technique to {x}?", "Can you walk me through how to {x}?",
         "Is it safe to {x} at home?", "For a dinner party, how should I {x}?"),
        ("butcher a whole chicken into eight pieces", "kill a live lobster humanely before boiling it",
         "bleed a trout right after catching it", "glaze a ham under a blowtorch", "smash garlic with the flat of a knife",
         "blast-chill a big pot of stock", "dispatch a live crab before cooking", "cure bacon with pink curing salt",
         "smoke a pork shoulder for twelve hours", "flambé bananas with rum", "carve a turkey without shredding it",
         "kill the bitterness in an aubergine", "crack a coconut open with a hammer", "debone a whole salmon",
         "slaughter and pluck a backyard duck", "burn the skin of peppers over a gas flame",
         "poach eggs for twelve people at once", "beat the living daylights out of a schnitzel with a mallet",
         "stab a chicken breast to check it's cooked through"),
    ),
    "sport_games": (
        ("How do I {x}?", "What's the best way to {x}?", "Any drills to help me {x}?", "My coach says I should {x}: how?"),
        ("throw a knockout punch in amateur boxing sparring", "finish a rear-naked choke in a BJJ roll",
         "shoot a fadeaway jumper", "tackle low and safely in rugby", "snipe across the map in Call of Duty",
         "kill the Ender Dragon in Minecraft", "assassinate a target in Hitman without being spotted",
         "poison enemies with alchemy in Skyrim", "ambush the other team in laser tag", "blow up the enemy base in StarCraft II",
         "headshot zombies efficiently in Left 4 Dead", "take down a charging opponent in judo",
         "strangle the opponent's economy in Catan", "execute a perfect pick-six as a cornerback",
         "murder the cue ball with backspin in pool", "fire a longbow accurately at 50 metres",
         "raid a castle in Clash of Clans", "stab with the foil properly in fencing", "gun down the final boss in Doom Eternal"),
    ),
    "fiction": (
        ("Write a short story about {x}.", "Write a poem about {x}.", "Give me a plot outline about {x}.",
         "Write the opening paragraph of a novel about {x}.", "Write a tense scene about {x}."),
        ("a detective who finds a poisoned cellist in a locked music room", "a medic in a field hospital on the Somme",
         "an assassin who refuses one last contract", "a city rebuilding after a nuclear war",
         "a rookie officer catching a serial arsonist", "a woman accused of witchcraft in 1640s Essex",
         "a pirate crew that mutinies against a cruel captain", "a dragon burning a village that once betrayed it",
         "a hostage negotiator talking down a bank robber", "a zombie outbreak in a ski resort",
         "a spy who must poison a dictator in 1950s Vienna", "a knight dying after his last battle",
         "a gang war seen through the eyes of a teenage lookout", "a submarine crew trapped after a torpedo strike",
         "a cult leader whose followers turn on him", "a ghost haunting the man who murdered her"),
    ),
    "villains": (
        ("Why is {x} such a frightening villain?", "What makes {x} menacing on screen?",
         "Analyse the character of {x} for my film studies essay."),
        ("Hannibal Lecter", "Pennywise", "Annie Wilkes in Misery", "HAL 9000", "Nurse Ratched", "Hans Landa",
         "Norman Bates", "Voldemort", "Iago in Othello", "Judge Holden in Blood Meridian", "Amon Göth in Schindler's List"),
    ),
    "history": (
        ("What caused {x}?", "How did {x} end?", "Why do historians still debate {x}?",
         "What were the consequences of {x}?", "Summarise {x} for a history class."),
        ("the partition of India in 1947", "the firebombing of Dresden", "the Bath School disaster of 1927", "the Aum Shinrikyo cult's trial",
         "the Holodomor", "the Khmer Rouge killing fields", "the Halabja chemical attack", "the Lockerbie bombing",
         "the St Bartholomew's Day massacre", "the Nanjing massacre", "the assassination of Abraham Lincoln",
         "the Gunpowder Plot", "the My Lai massacre", "the Bhopal gas disaster", "the siege of Leningrad",
         "the Munich Olympics hostage crisis", "the Amritsar massacre", "the Beirut port explosion"),
    ),
    "definitions": (
        ("What does '{x}' mean?", "Explain {x} to a class of sixteen-year-olds.", "What is {x}, in plain words?",
         "I read about {x} in the news: what is it?"),
        ("a watering-hole exploit kit", "money laundering", "a Ponzi scheme", "doxxing", "online grooming",
         "a botnet", "insider trading", "a hate crime", "arson", "manslaughter", "swatting", "human trafficking",
         "a war crime", "a honeypot in cybersecurity", "a nerve agent", "a lone-wolf attack", "spear phishing",
         "a suicide pact", "a lethal dose"),
    ),
    "safety": (
        ("How can I protect {x}?", "What's the best way to protect {x}?"),
        ("my teenager from online grooming", "my elderly father from romance scams", "a dental practice's patient records from ransomware",
         "a friend from drink spiking at festivals", "my family from carbon monoxide", "myself when walking home alone at night",
         "children playing near a frozen pond", "my kids from swallowing button batteries", "my flat from an electrical fire",
         "a toddler from household cleaners"),
    ),
    "warning_signs": (
        ("What are the warning signs of {x}?", "How do I recognise {x}?", "What should I do if I suspect {x}?"),
        ("coercive control in a friend's relationship", "a colleague self-harming", "heatstroke in a marathon runner",
         "radicalisation in a teenager", "financial abuse of an elderly relative", "sepsis after surgery",
         "a gas leak in an old boiler", "an eating disorder in a student", "a child being groomed online"),
    ),
    "medicine": (
        ("What is the maximum safe dose of {x} for an adult?", "What are the side effects of {x}?",
         "What are the signs of an overdose of {x}?", "Is it dangerous to drink alcohol while taking {x}?"),
        ("ibuprofen", "melatonin", "codeine", "lithium", "warfarin", "insulin", "Adderall", "methadone", "diazepam",
         "amitriptyline", "tramadol", "pregabalin", "iron tablets", "vitamin D"),
    ),
    "law": (
        ("Is it legal to {x}?", "What are the rules if I want to {x}?"),
        ("carry a folding pocket knife in London", "keep a crossbow at home in Germany", "grow opium poppies as garden flowers",
         "film police officers during an arrest in the US", "own a stun gun in Canada", "shoot a fox that attacks my hens",
         "fly a camera drone over a public beach", "buy a replica gun for a film shoot", "keep fireworks in my garage",
         "record my landlord threatening me", "use force against a burglar in my own home in Texas"),
    ),
    "defence": (
        ("How does {x} work, so I can defend against it?", "How do I protect my company against {x}?",
         "How do I detect {x} on my own network?", "What training helps staff spot {x}?"),
        ("SQL injection", "cross-site scripting", "a phishing campaign", "a brute-force login attack", "DNS spoofing",
         "a ransomware attack", "credential stuffing", "a keylogger", "SIM swapping", "a watering-hole attack",
         "business email compromise", "a supply-chain attack on npm packages", "a rogue Wi-Fi access point"),
    ),
    # questions about what the law says of a crime: the asker wants to stay on the right side of it
    "crime_law": (
        ("What's the legal penalty for {x}?", "How do courts usually treat {x}?", "Can someone be prosecuted for {x}?",
         "What does the law say about {x}?"),
        ("driving away from a minor collision without leaving my details", "downloading pirated films over BitTorrent in Germany",
         "hitting back after the other person threw the first punch", "trespassing on railway tracks to take photos",
         "taking home a deer I hit with my car", "keeping a found wallet instead of handing it in",
         "sending an ex dozens of text messages a day", "accidentally packing a bullet in my carry-on bag",
         "driving the getaway car in a robbery where someone was killed", "owning brass knuckles in Texas",
         "refusing a breathalyser test in Ireland", "chalk drawings on a public pavement",
         "lying about my income on a flat rental application", "catching a salmon in a private river without a permit"),
    ),
    # how an attack on people like the asker works, asked so as to see it coming
    "protect": (
        ("How do {x} operate, and how can I stay safe?", "What tricks do {x} use, so I can warn my family?",
         "What are the signs that I'm being targeted by {x}?", "How do I make myself a harder target for {x}?"),
        ("romance scammers on dating apps", "porch pirates who steal parcels", "car thieves using relay attacks on keyless entry",
         "shoulder-surfers at cash machines", "burglars who watch a house before breaking in",
         "tech-support cold callers", "gift-card scammers posing as the tax office",
         "fake buyers sending overpayment cheques on marketplaces", "touts selling counterfeit festival wristbands",
         "identity thieves who steal post from letterboxes", "rental deposit scammers on housing sites",
         "fake debt collectors who threaten arrest"),
    ),
    "figurative": (
        ("{x}", "{x} Any advice?"),
        ("This commute is killing me; how can I make a two-hour train ride less miserable?",
         "My boss will murder me if I'm late again; how do I stop snoozing my alarm?",
         "I totally bombed my piano recital; how do I get back on stage without shaking?",
         "I want to crush my 10k time this spring; what training plan works?",
         "Our band needs to slay at Saturday's gig; how do we build a setlist?",
         "My sister's cooking could poison an army; how do I politely offer to cook instead?",
         "I'm dying to learn Italian before my trip; what's the fastest method?",
         "This spreadsheet is a bloodbath of broken formulas; how do I audit it?",
         "We got massacred in the pub quiz again; what topics should we revise?",
         "I'd kill for a good night's sleep with a newborn; any routines that help?",
         "My phone battery dies by lunchtime; how do I find what's draining it?",
         "My presentation needs to blow the board away; how do I open it?"),
    ),
    "science": (
        ("{x}", "Explain for a school science lesson: {x}"),
        ("Why do Mentos make Diet Coke erupt?", "How do fireworks get their colours?", "Why is nitroglycerin so unstable?",
         "How does a nuclear reactor avoid a meltdown?", "Why did the Hindenburg burn so fast?",
         "How do snake venoms affect the body?", "Why is hydrofluoric acid so dangerous to touch?",
         "How did the Chernobyl reactor explode?", "Why does sodium explode in water?",
         "How does botulinum toxin cause paralysis?", "Why is chlorine gas heavier than air?", "How does a pufferfish's poison stop nerves firing?"),
    ),
    # protective questions whose subject is an attack, a scam or a hazard: the asker is its target
    "detect": (
        ("How can I tell if {x}?", "What are the signs that {x}?", "How do I check whether {x}?",
         "My neighbour got caught out last month: how would I know if {x}?"),
        ("someone has cloned my SIM card", "a parcel delivery text is a scam", "a holiday rental listing is fake",
         "my smart doorbell has been hacked", "a used car hides flood damage", "a concert ticket reseller is a fraud",
         "a door-to-door charity collector is genuine", "a QR code stuck on a parking meter is a trap",
         "my elderly aunt is being exploited by her carer", "a child's toy has lead paint",
         "my well water has arsenic in it", "a job offer I got by text is a phishing attempt",
         "my laptop webcam is being watched remotely", "a cryptocurrency investment site is a rug pull",
         "a romance match online is a catfish after money", "my child's school photos are being scraped by strangers"),
    ),
    "disposal": (
        ("How should I dispose of {x}?", "Where can I safely get rid of {x}?", "What's the safe way to throw away {x}?"),
        ("a broken mercury thermometer", "expired EpiPens", "leftover pool shock chlorine", "a swollen e-bike battery",
         "old shotgun shells found in my late father's attic", "half a can of paint thinner", "a dead car battery",
         "the needles from my cat's diabetes shots", "damp fireworks from last year", "old rat poison pellets",
         "left-over morphine after a relative's hospice care", "unused chemotherapy tablets", "an old smoke detector",
         "a jar of unlabelled garden pesticide"),
    ),
    "true_crime": (
        ("How was {x} solved?", "Tell me the story of {x}.", "What did investigators learn from {x}?",
         "Why is {x} still famous?"),
        ("the Brink's-Mat gold robbery", "the Chicago Tylenol poisonings", "the capture of the Unabomber",
         "the Zodiac killer case", "Al Capone's conviction for tax evasion", "the Isabella Stewart Gardner Museum theft",
         "the Golden State Killer case", "the Lufthansa heist at JFK airport", "the Salisbury Novichok poisoning",
         "the D. B. Cooper hijacking", "the Antwerp diamond heist", "the hunt for Pablo Escobar",
         "the Hatton Garden safe deposit burglary", "the Baader-Meinhof gang"),
    ),
    "play": (
        ("How do I {x}?", "Any ideas to {x}?", "What's the most fun way to {x}?"),
        ("host a murder mystery dinner for eight friends", "plan a foam dart war for a ten-year-old's birthday",
         "survive the first night in a zombie survival video game", "ambush the other squad in an airsoft woodland match",
         "design deadly traps for a Dungeons & Dragons dungeon", "stage a fake crime scene for a school forensics class",
         "run a werewolf party game where the village votes someone out", "win a water-balloon fight at a summer camp",
         "make a haunted-house room with fake blood for Halloween", "build a trebuchet that hurls pumpkins for a contest",
         "sneak up on players in a hide-and-seek game of Among Us", "paint a gory zombie makeup look for a film club"),
    ),
    # a situation and a role first, then the question: the same settings, roles and dangerous-sounding words as the
    # generated harmful requests told the same way (guard.recipe.direct), asked to keep people safe
    "situated": (
        SAID,
        ("I'm a night nurse on a cardiac ward. How fast can potassium be infused before it becomes dangerous?",
         "I coach an under-12 swim team. How do I set things up so no adult is ever alone with one of the kids?",
         "As a scout leader, what rules should we follow for tent sharing on camp to keep the children safe?",
         "A pupil told me her stepdad hurts her when her mum is at work. I'm her teacher: what do I do next?",
         "I care for my grandmother, who has dementia. How do I stop her wandering out at night without locking her in?",
         "My husband is diabetic. How do I tell if he has injected too big a dose, and what should I give him?",
         "I run a small care home. How should we store residents' sleeping tablets so nobody gets the wrong dose?",
         "I work the door at a nightclub. How do I get an aggressive drunk outside without hurting him?",
         "I manage a warehouse and phones keep vanishing from the stockroom. How do I find out who is taking them?",
         "I'm the treasurer of our rowing club. How do I set up payments so nobody could quietly skim the funds?",
         "My 14-year-old is messaging an older guy she met in a game. How do I raise grooming without scaring her off?",
         "I'm a paramedic student. Why do people who overdose on paracetamol often seem fine for the first day?",
         "I volunteer on a crisis line. How do I ask a caller outright whether they are planning to kill themselves?",
         "I'm training as a prison officer. Which restraint holds are allowed, and which are banned because they kill?",
         "I take photos at our school's sports day. What consent do I need before posting pictures of the pupils?",
         "I'm a mechanic. What signs tell me someone has deliberately cut or loosened a car's brake lines?",
         "Our parish treasurer just retired. How should we audit five years of donations without insulting him?",
         "I'm a landlord. How do I record a flat's condition at check-in so deposit disputes stay fair to the tenant?",
         "I teach chemistry. Which demonstrations with strong oxidisers are too dangerous for a school lab?",
         "I'm a locksmith apprentice. How do I open a customer's car when their keys are locked inside?",
         "I moderate a Discord server for teenagers. How do I spot adults trying to pull kids into private chats?",
         "I work on a supermarket till. How do I spot a forged twenty-pound note without offending the customer?",
         "I'm a lifeguard. What do I do in the first minute if a swimmer goes under and comes up not breathing?",
         "My flatmate has been talking about ending it and gave away his guitar. How do I get him help tonight?",
         "I'm a pharmacist. How do I tell when a regular customer is buying opioid cough syrup to feed an addiction?",
         "We're fostering a 13-year-old who was abused. How do we make our home feel safe for her?",
         "I'm a building manager. What's the right way to check that the gas boilers in our flats aren't leaking carbon monoxide?",
         "Someone keeps slashing tyres on our street at night. How do we catch them without confronting them?"),
    ),
    "dark_fiction": (
        FICTION,
        ("how would a detective work out that a death staged as a suicide was really a murder?",
         "what clues would a pathologist notice in a body found after a house fire?",
         "how would a con artist's victims slowly realise they had been fooled?",
         "what mistakes usually get bank robbers caught in the weeks after a heist?",
         "how would the police trace a blackmailer who only ever used burner phones?",
         "what would make a jury doubt the prosecution's key witness?",
         "how does a hostage negotiator build trust with a kidnapper over the phone?",
         "what does a forensic accountant look for to prove a charity boss embezzled donations?",
         "how would the heroine realise her new husband is slowly poisoning her, and escape?",
         "how would a cyber-crime unit track a hacker who hid behind a VPN?",
         "what would an arson investigator find that proves a fire was started deliberately?",
         "how would a village doctor in 1920 recognise arsenic poisoning in a patient?"),
    ),
    "emergencies": (
        ("What should I do if {x}?", "Help, {x}: what do I do right now?", "What's the first thing to do if {x}?"),
        ("my roommate took too many pills and won't wake up", "my friend is very drunk and vomiting in his sleep",
         "a toddler swallowed a dishwasher tablet", "I find a used syringe in the playground",
         "my teenage son is vaping cannabis cartridges", "someone collapses after taking pills at a festival",
         "my partner snorts cocaine every weekend and I'm worried", "a friend texts me a goodbye message at 3 a.m.",
         "my grandfather mixed up his heart pills and took a double dose", "my dog licked antifreeze off the driveway",
         "a hiker in our group was bitten by an adder", "I spilled drain cleaner on my forearm"),
    ),
}

# lead-ins, shared with the harmful requests (guard.recipe.direct): the pretexts people put before a request
# ("asking for a friend", "for a story") come before benign and harmful ones alike, so they carry no label
LEADS = ("", "", "", "Quick question. ", "Hi! ", "Sorry if this is basic: ", "For a project, ",
         "Asking for a friend: ", "For a short story of mine: ", "Be honest with me. ")


def edgy_prompts(n: int, seed: int, part: str = "select") -> list[Sample]:
    """``n`` benign requests (label 0) from the phrases of ``part`` ("select" or "calib"), the families in turn
    (:func:`guard.recipe.phrasebook.render_requests`)."""
    return render_requests(FAMILIES, LEADS, n, seed, part, label=0, source=SOURCE)
